"""OpenVINO GenAI as a target: the engine's own logit-processing order as an exact law (:mod:`.chain`).

The release and what exporting its tiny models needs are installed into the release cache entry of
``openvino-genai==X`` (:data:`specwatch.targets.install.BESIDE`); the end-to-end cases are not written yet.
"""
