"""Solo's OpenAI-compatible HTTP server (`solo serve`) and its continuous-batching scheduler.

protocol.py (request/response bodies), routes.py (the endpoints), app.py (`create_app`, auth, request
counting), state.py (settings, background model loading), scheduler.py (KV-cache slots, queue,
cancellation; no FastAPI), errors.py (SoloError -> HTTP status, OpenAI's error shape), metrics.py
(Prometheus), logprobs.py (OpenAI's logprobs shapes), runner.py (uvicorn, graceful shutdown), cli.py.
"""
