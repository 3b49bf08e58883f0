"""The model mirror: find GGUF models on a Hugging Face Hub, pull them into control's files
directory (checked, resumable, never to a host the operator did not allow), and turn each into
a draft catalog entry the operator publishes."""
