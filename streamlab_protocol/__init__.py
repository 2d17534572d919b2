"""The wire formats every part of the lab speaks, and nothing else.

    engine/v1/   the engine's gRPC contract, generated from
                 protos/streamlab_protocol/ by `make protos` (never edited by hand)
    sse.py       the Server-Sent Events codec (parser and encoder) shared by the
                 gateway, the clients, the OpenAI-upstream backend and the lab

The bottom layer: it imports no other package of the project (the import
contract in pyproject.toml keeps it so).
"""
