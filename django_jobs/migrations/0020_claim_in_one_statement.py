"""The claim in one statement when no queue controls are in use: version 6 of the claim function.

Version 5 read the queue controls and looked for a waiting job with a concurrency key, in two
statements of their own, before every claim. Version 6 claims first, with a statement that checks
both itself (a one-time filter, before it reads or locks a job), and takes the longer way only
when that statement claimed nothing. Same arguments and result: workers of the previous release
keep working with it. Going back makes version 5 again.
"""

from django.db import migrations

from django_jobs.store.sql.functions import replace_function


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0018_queue_demand")]

    operations = [replace_function("django_jobs_claim", 6)]
