"""Kubernetes' rules for the values gptpipe puts in objects: names, label values, quantities.

The API server refuses an object that breaks them, after a run has started; checking here, where
a value is made (a step's parameters, a job spec), refuses it before. Patterns from
k8s.io/apimachinery `pkg/util/validation/validation.go` and `pkg/api/resource/quantity.go`.
"""

import re

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a Service's or a TFJob's name
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a namespace
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # at most 63 of these
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")  # "4", "16Gi"
MAX_SUBDOMAIN = 253  # characters of a DNS-1123 subdomain (an object name)
TOLERATION_FIELDS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


def is_object_name(name: str) -> bool:
    """True for a valid object name (a Secret, a ServiceAccount): a DNS-1123 subdomain."""
    return len(name) <= MAX_SUBDOMAIN and bool(DNS1123_SUBDOMAIN.match(name))
