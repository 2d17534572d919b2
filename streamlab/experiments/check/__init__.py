"""`streamlab check URL`: a streaming conformance report for someone else's
OpenAI-compatible server (docs/check.md). Every streamed request is read by
the project's one measuring client, services/client/openai_stream.py.

    target.py       what is checked: the URL, the model, what the target offers
    hop.py          the check's own hops: a Toxiproxy in front of the target, and
                    an idle-cutting relay for the heartbeat's survival check
    framing.py      WHATWG framing, [DONE], usage, the error object, 4xx for bad input
    timing.py       time to first byte vs first token: a server or proxy that buffers
    heartbeat.py    bytes through a long silence, and surviving an idle-cutting hop
    cancel.py       the client leaves: the generation stops (through metrics)
    slow_reader.py  the client stops reading: the generation pauses or is cut,
                    never buffered whole (through metrics)
    resume.py       a cut stream resumed (Last-Event-ID, starting_after) gets
                    every missed event exactly once
    concurrency.py  N streams at once keep their cadence
    verdict.py      pass / fail / n/a of each check, its line, the exit status
    junit.py        the report as JUnit XML
    runner.py       every family in order, through the hop, as one Report
"""
