"""What every service shares and none owns: trace context and structured logs
(tracing.py). No service-specific code: engine, gateway and clients import it,
and it imports none of them."""
