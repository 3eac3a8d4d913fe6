"""``capsim serve``: an OpenAI-compatible server whose timing is the simulated deployment's
(capsim.serve.live drives the engine against the wall clock; capsim.serve.app is the HTTP
API; capsim.serve.metrics the Prometheus metrics under vLLM's names)."""
