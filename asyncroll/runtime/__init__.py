"""The asyncio runtime: admission, model gate, CPU dispatcher, worker pool and the trajectory loop."""
