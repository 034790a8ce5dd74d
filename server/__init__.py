"""`gptpipe serve`: TF Serving's REST API on one machine, with the model loaded in-process.

TF Serving has no package for this platform, so this package is its embedded stand-in, as
`kfp.local` is KFP's: the same paths, JSON and status codes as TensorFlow Serving 2.19's REST
API, over SavedModels it loads with TensorFlow, so one client (`client.py`, `gptpipe generate
--endpoint`) talks to it here and to TF Serving on a cluster. Each module follows one file of
TF Serving's source and cites it:

- `status.py`: TensorFlow's error codes and their HTTP status (http_server.cc);
- `json_tensor.py`: request JSON to input tensors and output tensors to JSON (json_tensor.cc);
- `servable.py`: one loaded version: its SavedModel, signature defs and predict;
- `versions.py`: which version is served: polling the folder, loading, switching, unloading
  (file_system_storage_path_source.cc, availability_preserving_policy.h);
- `guards.py`: the checks this server makes that TF Serving does not (generation length, text);
- `rest.py`: the paths and handlers (http_rest_api_handler.cc, http_rest_api_util.cc);
- `httpd.py`: the HTTP server: bodies, their limit, replies, internal errors;
- `app.py`: all of the above started and stopped together;
- `client.py`: the REST client.

It sits beside the steps (layer 4 of docs/design.md): it uses the shared layers (storage, TF
Serving's version folders in `components/serving.py`) and `contracts/`; only the CLI imports it.
"""
