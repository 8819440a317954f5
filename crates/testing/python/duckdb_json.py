"""Runs the SQL on stdin in an in-memory DuckDB and prints the rows of the
last statement as a JSON array of objects (adk-postgres-testing's
duckdb_json). Values JSON has no type for become strings: BLOBs as
PostgreSQL's bytea hex (\\x…), dates and times in ISO 8601, decimals,
UUIDs and intervals as Python prints them, NaN and infinities by name.

Extensions are never downloaded (only those built into the wheel, Parquet
and JSON among them, load), and the session's time zone is UTC.
"""

import datetime
import json
import math
import sys

import duckdb


def plain(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return str(value)


def main():
    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET TimeZone = 'UTC'")
    try:
        relation = connection.sql(sys.stdin.read())
        rows = []
        if relation is not None:
            columns = relation.columns
            rows = [dict(zip(columns, map(plain, row))) for row in relation.fetchall()]
    except duckdb.Error as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    json.dump(rows, sys.stdout)


main()
