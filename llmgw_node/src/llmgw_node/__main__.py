from llmgw_node.cli import main

main()
