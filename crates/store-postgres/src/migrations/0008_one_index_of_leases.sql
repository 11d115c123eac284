-- Expired leases are found through deliveries_leased_by_endpoint, which holds
-- every leased row too (only live leases exist, bounded by the endpoints'
-- caps, so scanning it whole is cheap); the second index of the same rows
-- cost every claim one more index insertion per delivery (ADR 0016).
DROP INDEX IF EXISTS deliveries_lease_expiry;
