"""Databases installed by pgflow itself (published ``@pgflow/core`` releases 0.8.0 .. 0.14.1).

* :mod:`~pgflow_cli.upstream.releases`: what each release leaves in the catalog (data);
* :mod:`~pgflow_cli.upstream.recognise`: which release installed a database (read-only);
* :mod:`~pgflow_cli.upstream.adopt`: bring a recognised release to pgflow-cli's baseline in place.
"""
