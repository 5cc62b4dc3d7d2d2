from django.db import migrations


def load(apps, schema_editor):
    from cloud.catalogue import load_gpu_catalogue

    load_gpu_catalogue(apps.get_model("cloud", "GPUModel"))


def unload(apps, schema_editor):
    from cloud.catalogue import GPU_MODELS

    apps.get_model("cloud", "GPUModel").objects.filter(slug__in=[r["slug"] for r in GPU_MODELS]).delete()


class Migration(migrations.Migration):
    dependencies = [("cloud", "0001_initial")]

    operations = [migrations.RunPython(load, unload)]
