-- The rollup's events query calls adk_usage_tokens three times per event.
-- Written with a sub-select, it could not be inlined and ran as a subplan
-- per call, about half of the query's time; as one expression the planner
-- inlines it. Same results (the exactness tests compare every bucket).
CREATE OR REPLACE FUNCTION adk_usage_tokens(p_payload jsonb, p_snake text, p_camel text) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE
        WHEN jsonb_typeof(coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)) = 'number'
         AND (coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)::text)::numeric
             BETWEEN 0 AND 9007199254740992
        THEN trunc((coalesce(p_payload->'usage_metadata'->p_snake, p_payload->'usage_metadata'->p_camel)::text)::numeric)::bigint
        ELSE 0
    END;
