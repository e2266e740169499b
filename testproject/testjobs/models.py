from django.db import models


class Execution(models.Model):
    """A ledger of job executions, written by the job itself, for exactly-once checks."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=200)
    pid = models.IntegerField()
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "testjobs_execution"

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}"


class TaskSignal(models.Model):
    """A ledger of the Tasks framework's signals, written by receivers in testjobs/tasks.py."""

    signal = models.CharField(max_length=40)
    sender = models.CharField(max_length=200)
    result_id = models.CharField(max_length=40, db_index=True)
    status = models.CharField(max_length=20)
    attempts = models.IntegerField()
    errors = models.JSONField(default=list)
    worker_ids = models.JSONField(default=list)
    pid = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "testjobs_tasksignal"
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.signal} {self.result_id} {self.status}"
