"""Generated protocol modules: CRI v1, CRI v1alpha2 and Koordinator's hook API.

Regenerate with ``python -m cri_api.regenerate [--from-upstream ../shared]``.
"""
