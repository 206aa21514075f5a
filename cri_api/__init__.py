"""Generated protocol modules: CRI v1, CRI v1alpha2, Koordinator's hook API,
the NRI API and the ttrpc envelope.

Regenerate with ``python -m cri_api.regenerate [--from-upstream ../shared]``.
"""
