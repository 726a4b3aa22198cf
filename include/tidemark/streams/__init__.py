"""Long-running streams: standing sinks and the supervisor that keeps them as a person wants them.

The rooms, each importing only those named before it: ``policy`` (what the supervisor decides about one
pipeline: pure), ``launch`` (run a job on this machine and find it again), ``standalone`` (the same
on a Spark standalone cluster), ``lag`` (how far a sink is behind; the nightly batch's
backpressure), ``lifeline`` (a standing sink's heartbeat, lease, progress and graceful stop, run
inside the Spark job), ``capture`` (a CDC pipeline's connector and slot, each cycle), ``cycle`` (one
supervisor cycle: gather, decide, act, log).
"""
