-- API tokens: making one, the lookup of a request's token, the stamp of its use, revoking.

-- name: insert_token
-- A new token (manage.py createjobtoken, the admin), read back whole, its columns in the order of
-- the model's fields. The queues and tasks are read as text[], as in token_grant.
-- Index: django_jobs_api_token_name_key and django_jobs_api_token_token_hash_key keep names and
-- hashes unique.
INSERT INTO django_jobs_api_token (name, token_hash, prefix, queues, can_enqueue, tasks,
                                   expires_at, created_by, user_id)
VALUES (%(name)s, %(token_hash)s, %(prefix)s, %(queues)s::jsonb, %(can_enqueue)s,
        %(tasks)s::jsonb, %(expires_at)s::timestamptz, %(created_by)s, %(user_id)s)
RETURNING id, name, token_hash, prefix, ARRAY(SELECT jsonb_array_elements_text(queues)) AS queues,
          can_enqueue, ARRAY(SELECT jsonb_array_elements_text(tasks)) AS tasks, expires_at,
          created_at, created_by, user_id, last_used_at, revoked_at

-- name: token_grant
-- The token of a hash, unless it was revoked: what a request to the API may do. The queues and
-- tasks are read as text[] so that either connection (Django's reads jsonb as text) gives a list.
-- An expired token is read too, with its expiry, so that its refusal can say why; user_id is
-- read so that the user's active flag can be checked (token_user_active).
-- Index: django_jobs_api_token_token_hash_key (the unique hash).
SELECT id,
       name,
       ARRAY(SELECT jsonb_array_elements_text(queues)) AS queues,
       can_enqueue,
       ARRAY(SELECT jsonb_array_elements_text(tasks)) AS tasks,
       expires_at,
       user_id
FROM django_jobs_api_token
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL

-- name: token_user_active
-- Whether the user a token acts for is active. The user table and its columns are those of
-- AUTH_USER_MODEL, filled in by store/api_tokens.py (user_active_statement): {table}, {pk} and
-- {active} (the is_active column, or true for a user model without one).
-- Index: the user table's primary key.
SELECT {active} AS active FROM {table} WHERE {pk} = %(user_id)s

-- name: stamp_token_use
-- When a token was last used; written at most once a minute per process (tokens/auth.py).
-- Index: the token table's primary key.
UPDATE django_jobs_api_token SET last_used_at = now() WHERE id = %(id)s

-- name: revoke_tokens
-- Revoking stamps revoked_at once; a token revoked already keeps its first stamp.
-- Index: the token table's primary key.
UPDATE django_jobs_api_token SET revoked_at = now()
WHERE id = ANY(%(ids)s::bigint[]) AND revoked_at IS NULL
RETURNING id
