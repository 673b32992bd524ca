"""Settings of the Celery workers that run memory-dag's Dagster runs (`dagster_celery.app`
imports a module of this name when it is on PYTHONPATH). The broker and the result backend are
the Redis of deploy/local/start.sh, or any Redis named by MEMORY_DAG_REDIS_URL."""

import logging
import os

from celery.signals import worker_process_init

broker_url = os.environ.get("MEMORY_DAG_REDIS_URL", "redis://127.0.0.1:63799/0")
result_backend = broker_url
task_default_queue = "dagster"
# One run at a time per worker process, and none held in reserve: a run is a shard's whole job.
# With early acks a worker takes the next message as soon as it starts a run, so a shard the
# queue hands over waits behind a busy worker while another worker idles (measured: the last
# four of eight shard runs went one at a time with two workers). Late acks keep the message
# in the queue until a worker is free. A run whose process is killed is still acked (Celery's
# task_reject_on_worker_lost stays off): run monitoring fails it; it is not run twice.
worker_prefetch_multiplier = 1
task_acks_late = True
broker_connection_retry_on_startup = True

# Each worker process warms up as it starts (imports the stage modules, loads the embedding
# model: memory_dag/warm_up.py), so its first run does not pay ~1.3 s for it. Celery gives a
# starting process 4 s to say it is alive; a warm-up on a loaded machine may take longer.
worker_proc_alive_timeout = 60


@worker_process_init.connect
def warm_up_worker_process(**_: object) -> None:
    from memory_dag.warm_up import warm_up

    logging.getLogger(__name__).info("warmed up in %.1f s", warm_up())
