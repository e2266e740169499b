from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("testjobs", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="TaskSignal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("signal", models.CharField(max_length=40)),
                ("sender", models.CharField(max_length=200)),
                ("result_id", models.CharField(db_index=True, max_length=40)),
                ("status", models.CharField(max_length=20)),
                ("attempts", models.IntegerField()),
                ("errors", models.JSONField(default=list)),
                ("worker_ids", models.JSONField(default=list)),
                ("pid", models.IntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"db_table": "testjobs_tasksignal", "ordering": ["id"]},
        ),
    ]
