DROP TABLE adk_schema_sql;
