"""
Database-level helpers, one behaviour on both databases: a many-row update of different values
per row, a many-row insert without model instances (COPY on PostgreSQL), new rows of different
models inserted in one statement, and a cursor for statements prepared on the server.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models.sql import InsertQuery

PREPARE_THRESHOLD = 5  # a hot statement (``fast_cursor``) is prepared on its fifth use on a connection


def update_rows(model, objs: list, fields: list[str]) -> None:
    """
    Write ``fields`` of saved ``objs``, a different value per row, in one statement. Django's
    bulk_update builds a CASE per field and row (most of a 100-row batch's time in the
    scheduler); on PostgreSQL this joins one typed array per column, unnested: a statement of
    the same short text whatever the number of rows (a VALUES list of a placeholder per value
    cost more to build and parse than the update itself). SQLite keeps bulk_update.
    """
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_update(objs, fields)
        return
    qn = connection.ops.quote_name
    pk = model._meta.pk
    columns = [pk, *(model._meta.get_field(name) for name in fields)]
    for field in columns:
        if isinstance(field, models.JSONField):
            raise TypeError(f"update_rows cannot write {field.name}: JSON values do not go in an array.")
    arrays = [[field.get_db_prep_save(getattr(obj, field.attname), connection) for obj in objs] for field in columns]
    sources = ", ".join(f"%s::{field.db_type(connection)}[]" for field in columns)
    assignments = ", ".join(f"{qn(field.column)} = v.{qn(field.column)}" for field in columns[1:])
    names = ", ".join(qn(field.column) for field in columns)
    # Only quoted names and types from the model's metadata are formatted in; every value is a parameter.
    sql = (f"UPDATE {qn(model._meta.db_table)} AS t SET {assignments} "  # noqa: S608
           f"FROM unnest({sources}) AS v({names}) WHERE t.{qn(pk.column)} = v.{qn(pk.column)}")
    with connection.cursor() as cursor:
        cursor.execute(sql, arrays)


def copy_rows(model, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """
    Insert ``rows`` (values of the model's fields named in ``columns``, by attribute name, e.g.
    ``reservation_id``) with every constraint checked as usual. PostgreSQL takes them by COPY: no
    model instance, no field preparation per row (the scheduler writes thousands a cycle); a
    JSON field's value goes in as JSON. SQLite: bulk_create. Defaults are not applied: give them.
    """
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**dict(zip(columns, row, strict=True))) for row in rows])
        return
    from psycopg.types.json import Jsonb

    qn = connection.ops.quote_name
    fields = {f.attname: f for f in model._meta.concrete_fields}
    for name in columns:
        _check_copyable(fields[name])
    json_at = [i for i, name in enumerate(columns) if isinstance(fields[name], models.JSONField)]
    statement = f"COPY {qn(model._meta.db_table)} ({', '.join(qn(fields[c].column) for c in columns)}) FROM STDIN"
    with connection.cursor() as cursor, connection.wrap_database_errors, cursor.cursor.copy(statement) as copy:
        for row in rows:
            if json_at:
                row = list(row)
                for i in json_at:
                    if row[i] is not None:
                        row[i] = Jsonb(row[i])
            copy.write_row(row)


# Fields whose values psycopg writes as Django would: no preparation of their own is skipped.
COPYABLE = (models.AutoField, models.BigAutoField, models.BigIntegerField, models.BooleanField, models.CharField,
            models.DateTimeField, models.FloatField, models.ForeignKey, models.IntegerField,
            models.PositiveIntegerField, models.PositiveSmallIntegerField, models.SmallIntegerField,
            models.TextField, models.UUIDField)


def _check_copyable(field) -> None:
    plain_json = type(field) is models.JSONField and field.encoder is None
    if not plain_json and type(field) not in COPYABLE:
        raise TypeError(f"copy_rows cannot write {field.model.__name__}.{field.name} ({type(field).__name__}): "
                        "its values need the field's own preparation; use bulk_create.")


def insert_statement(objs: list[models.Model], *, also: str = "", also_params: list | tuple = (),
                     result: str = "SELECT 1") -> tuple[str, list]:
    """
    PostgreSQL: one statement that INSERTs each of the new ``objs`` as ``save(force_insert=True)``
    would (the fields prepared by the ORM's own compiler, auto_now values set on the objects),
    one WITH clause each, then the WITH clauses ``also`` (``name AS (...)``, with ``also_params``),
    and returns what ``result`` selects. No signals are sent: for models nothing listens to.
    ``mark_saved`` the objects once it ran.
    """
    db = connections[DEFAULT_DB_ALIAS]  # the connection itself: every use of the proxy is a lookup
    clauses, params = [], []
    for i, obj in enumerate(objs):
        meta = obj._meta
        fields = [f for f in meta.local_concrete_fields if not f.generated]
        if obj.pk is None:  # the database numbers it
            fields = [f for f in fields if f is not meta.auto_field]
        query = InsertQuery(type(obj))
        query.insert_values(fields, [obj])
        [(sql, values)] = query.get_compiler(connection=db).as_sql()
        clauses.append(f"inserted_{i} AS ({sql})")
        params += values
    if also:
        clauses.append(also)
        params += also_params
    return f"WITH {', '.join(clauses)} {result}", params


def mark_saved(*objs: models.Model) -> None:
    """What ``save()`` records on an instance it inserted, for rows inserted by ``insert_statement``."""
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias


def insert_objects(*objs: models.Model) -> None:
    """
    Insert the new ``objs`` (of models nothing listens to): one statement on PostgreSQL
    (``insert_statement``), one ``save(force_insert=True)`` each on SQLite.
    """
    if connection.vendor != "postgresql":
        for obj in objs:
            obj.save(force_insert=True)
        return
    sql, params = insert_statement(list(objs))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    mark_saved(*objs)


def fast_cursor():
    """
    PostgreSQL: a cursor with server-side binding whose statements are prepared once per
    connection (on their fifth use, psycopg's threshold) where Django's client-side cursor has
    every one parsed and planned again -- most of the database's work for these small statements.
    Django turns preparing off on its connections (for transaction-mode poolers, which do not keep
    a session's prepared statements); it is turned on here for this connection's server-side
    binding cursors only, which are these (Django's own cursors bind client-side and never
    prepare), unless the database's OPTIONS say ``prepare_threshold`` (None: a deployment behind
    such a pooler keeps it off). Logged like any Django cursor when queries are captured.
    Prepared, a statement always runs on its generic plan (settings: ``plan_cache_mode``), made
    once for any values: use it only for statements whose generic plan is the one they need --
    key lookups, not the fast path's quota count or competitor check (five times slower so).
    """
    import psycopg

    db = connections[DEFAULT_DB_ALIAS]  # one lookup: each use of the ``connection`` proxy is another
    db.ensure_connection()
    if db.connection.prepare_threshold is None and "prepare_threshold" not in db.settings_dict["OPTIONS"]:
        db.connection.prepare_threshold = PREPARE_THRESHOLD
    raw = psycopg.Cursor(db.connection)
    return db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)
