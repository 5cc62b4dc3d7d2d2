from django.db import migrations, models

# Every change the scheduler's kept index must follow writes the nodes it touched to the feed, in
# the same transaction (so no commit order can hide one): allocations added, removed or moved
# (statement triggers: one INSERT per statement, however many rows a COPY or a batch wrote);
# a node's or a GPU's right to take work (spare, state, health; an idle attestation starting or
# ending); hardware added, removed, recabled or its topology inside a node learnt. Archiving an allocation changes nothing it covers.
CREATE = """
CREATE FUNCTION meridian_feed_allocations() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO provisioning_capacity_change (xid, kind, node_id)
      SELECT DISTINCT pg_current_xact_id()::text::bigint, 0, node_id FROM new_rows;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO provisioning_capacity_change (xid, kind, node_id)
      SELECT DISTINCT pg_current_xact_id()::text::bigint, 0, node_id FROM old_rows;
  ELSE
    INSERT INTO provisioning_capacity_change (xid, kind, node_id)
      SELECT DISTINCT pg_current_xact_id()::text::bigint, 0, moved.node_id FROM new_rows n JOIN old_rows o USING (id),
        LATERAL (VALUES (n.node_id), (o.node_id)) AS moved(node_id)
      WHERE (n.node_id, n.gpu_id, n.starts_at, n.ends_at, n.mem_lo, n.mem_hi, n.share_class)
            IS DISTINCT FROM (o.node_id, o.gpu_id, o.starts_at, o.ends_at, o.mem_lo, o.mem_hi, o.share_class);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER meridian_feed_allocations_insert AFTER INSERT ON provisioning_allocation
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION meridian_feed_allocations();
CREATE TRIGGER meridian_feed_allocations_delete AFTER DELETE ON provisioning_allocation
  REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION meridian_feed_allocations();
CREATE TRIGGER meridian_feed_allocations_update AFTER UPDATE ON provisioning_allocation
  REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows FOR EACH STATEMENT
  EXECUTE FUNCTION meridian_feed_allocations();

CREATE FUNCTION meridian_feed_node() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO provisioning_capacity_change (xid, kind, node_id)
    VALUES (pg_current_xact_id()::text::bigint, TG_ARGV[0]::smallint, COALESCE(NEW.id, OLD.id));
  RETURN NULL;
END $$;
CREATE TRIGGER meridian_feed_node_rights AFTER UPDATE ON cloud_node FOR EACH ROW
  WHEN ((OLD.is_spare, OLD.state, OLD.health) IS DISTINCT FROM (NEW.is_spare, NEW.state, NEW.health))
  EXECUTE FUNCTION meridian_feed_node(1);
CREATE TRIGGER meridian_feed_node_shape AFTER UPDATE ON cloud_node FOR EACH ROW
  WHEN ((OLD.region_id, OLD.fabric_id, OLD.leaf_id, OLD.pool, OLD.confidential, OLD.hostname)
        IS DISTINCT FROM (NEW.region_id, NEW.fabric_id, NEW.leaf_id, NEW.pool, NEW.confidential, NEW.hostname))
  EXECUTE FUNCTION meridian_feed_node(2);
CREATE TRIGGER meridian_feed_node_added AFTER INSERT OR DELETE ON cloud_node FOR EACH STATEMENT
  EXECUTE FUNCTION meridian_feed_fleet();

CREATE FUNCTION meridian_feed_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO provisioning_capacity_change (xid, kind, node_id)
    VALUES (pg_current_xact_id()::text::bigint, TG_ARGV[0]::smallint, NEW.node_id);
  RETURN NULL;
END $$;
CREATE TRIGGER meridian_feed_gpu_rights AFTER UPDATE ON cloud_gpu FOR EACH ROW
  WHEN ((OLD.health, OLD.state) IS DISTINCT FROM (NEW.health, NEW.state))
  EXECUTE FUNCTION meridian_feed_row(1);
CREATE TRIGGER meridian_feed_gpu_shape AFTER UPDATE ON cloud_gpu FOR EACH ROW
  WHEN ((OLD.node_id, OLD.index, OLD.model_id, OLD.memory_mib, OLD.nvlink_domain, OLD.pcie_switch, OLD.numa_node)
        IS DISTINCT FROM
        (NEW.node_id, NEW.index, NEW.model_id, NEW.memory_mib, NEW.nvlink_domain, NEW.pcie_switch, NEW.numa_node))
  EXECUTE FUNCTION meridian_feed_fleet();
CREATE TRIGGER meridian_feed_gpu_added AFTER INSERT OR DELETE ON cloud_gpu FOR EACH STATEMENT
  EXECUTE FUNCTION meridian_feed_fleet();

CREATE TRIGGER meridian_feed_attest_started AFTER INSERT ON provisioning_operation FOR EACH ROW
  WHEN (NEW.kind = 'attest' AND NEW.node_id IS NOT NULL) EXECUTE FUNCTION meridian_feed_row(1);
CREATE TRIGGER meridian_feed_attest_moved AFTER UPDATE ON provisioning_operation FOR EACH ROW
  WHEN (NEW.kind = 'attest' AND NEW.node_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state)
  EXECUTE FUNCTION meridian_feed_row(1);
"""
# Functions the triggers above name, created first.
FLEET = """
CREATE FUNCTION meridian_feed_fleet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO provisioning_capacity_change (xid, kind, node_id)
    VALUES (pg_current_xact_id()::text::bigint, 2, NULL);
  RETURN NULL;
END $$;
"""
DROP = """
DROP TRIGGER IF EXISTS meridian_feed_attest_moved ON provisioning_operation;
DROP TRIGGER IF EXISTS meridian_feed_attest_started ON provisioning_operation;
DROP TRIGGER IF EXISTS meridian_feed_gpu_added ON cloud_gpu;
DROP TRIGGER IF EXISTS meridian_feed_gpu_shape ON cloud_gpu;
DROP TRIGGER IF EXISTS meridian_feed_gpu_rights ON cloud_gpu;
DROP TRIGGER IF EXISTS meridian_feed_node_added ON cloud_node;
DROP TRIGGER IF EXISTS meridian_feed_node_shape ON cloud_node;
DROP TRIGGER IF EXISTS meridian_feed_node_rights ON cloud_node;
DROP TRIGGER IF EXISTS meridian_feed_allocations_update ON provisioning_allocation;
DROP TRIGGER IF EXISTS meridian_feed_allocations_delete ON provisioning_allocation;
DROP TRIGGER IF EXISTS meridian_feed_allocations_insert ON provisioning_allocation;
DROP FUNCTION IF EXISTS meridian_feed_row(), meridian_feed_node(), meridian_feed_allocations(),
  meridian_feed_fleet();
"""


def create_triggers(apps, schema_editor):
    # PostgreSQL only: the embedded SQLite default builds the scheduler's index every cycle.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FLEET + CREATE)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)

class Migration(migrations.Migration):

    dependencies = [
        ('provisioning', '0030_node_validation'),
        ('cloud', '0017_gpu_topology'),
    ]

    operations = [
        migrations.CreateModel(
            name='CapacityChange',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('xid', models.BigIntegerField(db_index=True)),
                ('kind', models.PositiveSmallIntegerField(
                    choices=[(0, 'allocations'), (1, 'may take work'), (2, 'hardware or cabling')])),
                ('node_id', models.UUIDField(blank=True, null=True)),
            ],
            options={
                'db_table': 'provisioning_capacity_change',
            },
        ),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
