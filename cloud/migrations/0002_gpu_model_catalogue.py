from django.db import migrations


def load(apps, schema_editor):
    from cloud.catalogue import GPU_MODELS

    GPUModel = apps.get_model("cloud", "GPUModel")
    for row in GPU_MODELS:
        GPUModel.objects.update_or_create(slug=row["slug"], defaults=row)


def unload(apps, schema_editor):
    from cloud.catalogue import GPU_MODELS

    apps.get_model("cloud", "GPUModel").objects.filter(slug__in=[r["slug"] for r in GPU_MODELS]).delete()


class Migration(migrations.Migration):
    dependencies = [("cloud", "0001_initial")]

    operations = [migrations.RunPython(load, unload)]
