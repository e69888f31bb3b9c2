package proxier

import "k8s.io/client-go/rest"

// TuneClientConfig sets up cfg the way the agent talks to the apiserver:
// protobuf, which is smaller and cheaper to decode than JSON for 10,000s of
// Services and EndpointSlices, and no client-side throttling of the cold
// start's lists and watches. userAgent names the client.
func TuneClientConfig(cfg *rest.Config, userAgent string) {
	cfg.UserAgent = userAgent
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 50, 100
}
