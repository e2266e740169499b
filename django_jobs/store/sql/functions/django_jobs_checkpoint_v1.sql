-- A job's checkpoint (store/steps.py): the results of its recorded steps, by name, and its
-- cursors' values, by name, each as JSON text (NULL: none). Read by a database worker's run on
-- its first step or cursor (checkpoint, steps.sql), and by the HTTP API's claims for the job they
-- claim (call_claim_with_checkpoint, call_finish_then_claim), in the claim's own statement. A
-- function, so that its two reads are planned once per connection, not with every claim: the
-- claim's statement stays as cheap to plan as the call of the claim alone. VOLATILE (the
-- default), so that its reads take a snapshot of their own, after the claim's: every step and
-- cursor that an earlier attempt committed before the job became claimable is in it.
-- Index: step_job_name_unique; the job table's primary key.
-- Made by 0023_checkpoint_function.
CREATE FUNCTION django_jobs_checkpoint(p_job_id bigint)
RETURNS TABLE (steps text, cursors text)
LANGUAGE plpgsql AS $body$
BEGIN
    RETURN QUERY
SELECT (SELECT jsonb_object_agg(s.name, s.result)::text
        FROM django_jobs_step s WHERE s.job_id = p_job_id),
       (SELECT jsonb_object_agg(k.key, k.value -> 'value')::text
        FROM django_jobs_job j, jsonb_each(j.cursors) k WHERE j.id = p_job_id)
;
END
$body$
