"""Context parallelism: the compact multimodal attention mask and the CP ranks' token
assignment."""
