"""metrics.py: a Prometheus exposition read with prometheus_client's parser."""

from __future__ import annotations

from streamlab.experiments.check.metrics import gauge


def test_gauge_sums_every_label_set_and_knows_absence() -> None:
    text = ("# HELP vllm:num_requests_running running\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="a"} 2.0\n'
            'vllm:num_requests_running{model_name="b"} 1\n'
            "vllm:num_requests_running_total 9\n"
            "streamlab_engine_running 0\n")
    assert gauge(text, "vllm:num_requests_running") == 3.0
    assert gauge(text, "streamlab_engine_running") == 0.0
    assert gauge(text, "sglang:num_running_reqs") is None


def test_a_sample_with_a_timestamp_is_read_as_its_value() -> None:
    # The hand-written reader took the timestamp for the value.
    text = ("# TYPE llamacpp:requests_processing gauge\n"
            "llamacpp:requests_processing 2 1733450000000\n")
    assert gauge(text, "llamacpp:requests_processing") == 2.0


def test_labels_with_spaces_and_escapes_do_not_confuse_it() -> None:
    text = ('# TYPE sglang:num_running_reqs gauge\n'
            'sglang:num_running_reqs{model_name="a b \\"c\\"",dp="0"} 4\n'
            'sglang:num_running_reqs{model_name="x",dp="1"} 1\n')
    assert gauge(text, "sglang:num_running_reqs") == 5.0


def test_a_line_the_parser_refuses_loses_only_itself() -> None:
    text = ("# TYPE tgi_batch_current_size gauge\n"
            "tgi_batch_current_size 3\n"
            "this is not prometheus {{{\n")
    assert gauge(text, "tgi_batch_current_size") == 3.0


def test_counters_and_histograms_are_no_running_gauge() -> None:
    text = ("# TYPE vllm:num_requests_running counter\n"
            "vllm:num_requests_running_total 7\n")
    assert gauge(text, "vllm:num_requests_running") is None
