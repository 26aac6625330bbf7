"""The core of ggml (ggml.h, gguf.h): tensors, op constructors, graphs, contexts, GGUF files."""
