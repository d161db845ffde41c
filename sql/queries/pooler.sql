-- Is this connection a server session of its own, or does a connection pooler stand between?
-- (pgflow_cli/operations/pooler.py). Read-only, any role.

--@name server_session
-- The server process running this statement, and where the server listens as it sees this
-- connection: the address and port the client (or the pooler) reached it at, NULL over a Unix
-- socket; then its own port and socket directories (NULL where this role may not read them).
SELECT pg_catalog.pg_backend_pid() AS backend_pid,
       pg_catalog.host(pg_catalog.inet_server_addr()) AS server_addr,
       pg_catalog.inet_server_port() AS server_port,
       pg_catalog.current_setting('port')::integer AS port,
       (SELECT s.setting FROM pg_catalog.pg_settings AS s WHERE s.name = 'unix_socket_directories') AS socket_dirs;
--@end
