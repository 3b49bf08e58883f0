"""The admin listener: metrics now, the REST API and dashboard later."""
