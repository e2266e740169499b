"""The claim in one statement when no queue controls are in use: version 7 of the claim function.

Versions 5 and 6 read the queue controls and looked for a waiting job with a concurrency key, in
two statements of their own, before every claim. Version 7 claims first, with a statement that
checks both itself (a one-time filter, before it reads or locks a job), and takes the longer way
only when that statement claimed nothing. Same arguments and result: workers of the previous
release keep working with it. Going back makes version 6 again.
"""

from django.db import migrations

from django_jobs.store.sql.functions import replace_function


class Migration(migrations.Migration):
    dependencies = [("django_jobs", "0019_reaper_and_claim_scale")]

    operations = [replace_function("django_jobs_claim", 7)]
