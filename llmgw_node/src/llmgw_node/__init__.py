"""llmgw."""
