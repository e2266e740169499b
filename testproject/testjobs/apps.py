from django.apps import AppConfig


class TestJobsConfig(AppConfig):
    name = "testproject.testjobs"
    label = "testjobs"
    verbose_name = "Jobs used by the test suite"
