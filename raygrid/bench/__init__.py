"""Benchmarks: `raygrid bench serve` (online, any OpenAI-compatible endpoint)."""
