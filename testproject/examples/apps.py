from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    name = "testproject.examples"
    label = "examples"
    verbose_name = "Example jobs"
