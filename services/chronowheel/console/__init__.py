"""`chronowheel console`: an operations console in the browser for one namespace.

A separate process that reads what the nodes write (Cassandra tables, the `<ns>.state`,
`<ns>.rejected` and `<ns>.dead` topics, read_committed) and sends the same v1 commands a client
would. Server-rendered HTML with small inline scripts; nothing is loaded from elsewhere.

- `sources`: the data access (shared with the `status`, `job` and `tail` commands);
- `actions`: the job actions the console offers (one entry per v1 command);
- `pages`: HTML rendering, pure functions of the data;
- `app`: the aiohttp application: routes, authentication, CSRF, security headers.

docs/console.md describes the pages and the safety design.
"""
