import os

from django.apps import AppConfig


class TestJobsConfig(AppConfig):
    name = "testproject.testjobs"
    label = "testjobs"
    verbose_name = "Jobs used by the test suite"

    def ready(self) -> None:
        # The tests of traces configure OpenTelemetry in the worker's processes so (an
        # application would in its settings or its entry point).
        if os.environ.get("TESTJOBS_SPANS_FILE"):
            from testproject.testjobs import spans

            spans.configure_from_environment()
