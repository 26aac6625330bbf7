"""Memory: backend buffers and buffer types (ggml-backend.h), and pyggml's record of them."""
