"""What operators see: figures (:mod:`.stats`), Prometheus metrics (:mod:`.metrics`),
OpenTelemetry traces (:mod:`.tracing`), log lines (:mod:`.logs`), and the read replica those
figures and lists may be read from (:mod:`.replica`)."""
