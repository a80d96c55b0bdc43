"""An SGLang-compatible HTTP front for every engine (docs/serving.md).

slime's HTTP generate functions (search-r1, retool, ...) POST SGLang's native `/generate` at
`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`. This package serves that API
on 127.0.0.1 in front of the run's engine, so those functions run unchanged:

    sglang_api.py  SGLang's request JSON -> GenerationRequest, GenerationResult -> response JSON
    server.py      the aiohttp server on the rollout loop (/generate, /health, /abort_request, ...)
    args.py        the slime args it sets (sglang_router_ip / _port, ...), started lazily
    preflight.py   engine.serve_http checks
"""
