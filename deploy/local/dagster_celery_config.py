"""Settings of the Celery workers that run memory-dag's Dagster runs (`dagster_celery.app`
imports a module of this name when it is on PYTHONPATH). The broker and the result backend are
the Redis of deploy/local/start.sh, or any Redis named by MEMORY_DAG_REDIS_URL."""

import os

broker_url = os.environ.get("MEMORY_DAG_REDIS_URL", "redis://127.0.0.1:63799/0")
result_backend = broker_url
task_default_queue = "dagster"
# One run at a time per worker process: a run is a shard's whole job.
worker_prefetch_multiplier = 1
task_acks_late = False
broker_connection_retry_on_startup = True
