CREATE OR REPLACE FUNCTION adk_usage_tokens(p_payload jsonb, p_snake text, p_camel text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (SELECT CASE WHEN jsonb_typeof(v) = 'number' AND (v::text)::numeric BETWEEN 0 AND 9007199254740992
                        THEN trunc((v::text)::numeric)::bigint ELSE 0 END
            FROM coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel) AS v);
