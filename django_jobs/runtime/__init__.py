"""What the worker, the reaper and the HTTP API share, below all three: the one retry policy
(:mod:`~django_jobs.runtime.backoff`) and worker ids (:mod:`~django_jobs.runtime.identity`)."""
