-- A threshold of the views (docs/operations.md): the custom setting django_jobs.<name>, set per
-- database or role (ALTER DATABASE app SET django_jobs.worker_timeout = 120), else fallback.
-- Made by 0003_operations.
CREATE OR REPLACE FUNCTION django_jobs_setting(name text, fallback float8) RETURNS float8
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(nullif(current_setting('django_jobs.' || name, true), '')::float8, fallback)
$$
