-- The wake id of 0003 framed the route with its length in the *server's*
-- encoding while hashing its UTF-8 bytes: on a database not in UTF8, a
-- route name outside ASCII got an id no gateway computes, and its waiters
-- fell back to the slow poll. Frame with the UTF-8 length, as
-- `waiters::wake_id` does.
CREATE OR REPLACE FUNCTION idemgate_wake_id(p_route TEXT, p_scope BYTEA, p_key TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(int4send(octet_length(convert_to(p_route, 'UTF8'))) || convert_to(p_route, 'UTF8')
                         || int4send(length(p_scope)) || p_scope
                         || convert_to(p_key, 'UTF8')), 'hex')
$$;
