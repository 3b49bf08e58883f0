"""The OpenAI data path: parse, pick a replica, relay, account."""
