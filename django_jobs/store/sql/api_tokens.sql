-- API tokens: making one, the lookup of a request's token, the stamp of its use, revoking.

-- name: insert_token
-- A new token (manage.py createjobtoken), read back whole. The queues are read as text[], as
-- in token_grant. Index: django_jobs_api_token_name_key and
-- django_jobs_api_token_token_hash_key keep names and hashes unique.
INSERT INTO django_jobs_api_token (name, token_hash, prefix, queues, can_enqueue, created_by)
VALUES (%(name)s, %(token_hash)s, %(prefix)s, %(queues)s::jsonb, %(can_enqueue)s, %(created_by)s)
RETURNING id, name, token_hash, prefix, ARRAY(SELECT jsonb_array_elements_text(queues)) AS queues,
          can_enqueue, created_at, created_by, last_used_at, revoked_at

-- name: token_grant
-- The token of a hash, unless it was revoked: what a request to the API may do. The queues are
-- read as text[] so that either connection (Django's reads jsonb as text) gives a list.
-- Index: django_jobs_api_token_token_hash_key (the unique hash).
SELECT id,
       name,
       ARRAY(SELECT jsonb_array_elements_text(queues)) AS queues,
       can_enqueue
FROM django_jobs_api_token
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL

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
