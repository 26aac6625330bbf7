"""Backends (ggml-backend.h, ggml-alloc.h, ggml-cpu.h): backends, devices, registries, events,
graph allocators, schedulers, and what is built on them."""
