-- Version 15: an endpoint's own retry schedule and attempt limit (issue 57).
-- Both are set or both are NULL (the service's schedule and limit apply).
-- The schedule is whole seconds, comma-separated; new deliveries and
-- replays take the attempt limit from here.
ALTER TABLE endpoints ADD COLUMN retry_schedule VARCHAR;
ALTER TABLE endpoints ADD COLUMN max_attempts BIGINT;
