package kubernetes

// APIServerConfig is apiServerConfig, for the stock control: a stock
// client configured as New configures the routed one.
var APIServerConfig = apiServerConfig
