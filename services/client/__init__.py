"""Clients of the lab's surfaces, each recording its own stream.

    openai_stream  the OpenAI-style SSE client (and `sse_chat`, the same as a TransportRun)
    resume_stream  an EventSource-like client of /v1/streams (retry:, Last-Event-ID)
    ws_stream, polling, grpc_stream   the other transports, measured alike
    silent         a client that sends its request and never reads
    transport_run  TransportRun: one run of one transport, in the same terms for all

They import the protocol package (streamlab_protocol: the SSE codec, the
gRPC stubs) and nothing of the lab tool: what drives them through the lab
and judges the figures (scenarios, benches, the soak) lives in streamlab/.
"""
