"""API tokens, in one folder: :mod:`~django_jobs.tokens.auth` (made, stored as hashes, looked up
and cached briefly) and :mod:`~django_jobs.tokens.admin` (making, listing, revoking). The table is
:class:`django_jobs.models.ApiToken`; ``manage.py createjobtoken`` makes one."""
