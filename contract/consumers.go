package contract

import "strconv"

// Durable consumer names. Other services, nats.conf's grants and tests
// name them too (status reads the dispatch lanes' queues), so they belong
// to the contract.
const (
	// ConsumerIngest reads TASKS.
	ConsumerIngest = "ingest"
	// ConsumerIngestStart reads the scheduled starts (broadcast.start.>).
	ConsumerIngestStart = "ingest-start"
	// ConsumerRender reads RENDER.
	ConsumerRender = "render"
	// ConsumerStatus reads EVENTS.
	ConsumerStatus = "status"
	// ConsumerFeedback reads RECEIPTS: feedback turns receipts into events.
	ConsumerFeedback = "feedback"
	// ConsumerFeedbackIndex reads the sent events of EVENTS: feedback
	// indexes their provider ids.
	ConsumerFeedbackIndex = "feedback-index"
	// ConsumerFeedbackWxPusher reads the sent events of EVENTS: feedback
	// polls the delivery status of WxPusher sends.
	ConsumerFeedbackWxPusher = "feedback-wxpusher"
	// DispatchConsumerPrefix begins every dispatch lane's consumer name.
	DispatchConsumerPrefix = "dispatch"
)

// DispatchConsumer is the durable consumer of account's jobs of priority p
// (a lane). Normal jobs keep the name the account's single consumer had
// before there were lanes ("dispatch-<account>"); high and low use another
// prefix, so that no lane's name can equal another account's
// ("dispatch_high-<account>", "dispatch_low-<account>": account names never
// contain the underscore right after "dispatch").
func DispatchConsumer(account string, p Priority) string {
	switch p {
	case PriorityHigh, PriorityLow:
		return DispatchConsumerPrefix + "_" + string(p) + "-" + account
	}
	return DispatchConsumerPrefix + "-" + account
}

// MaxStatusPartitions bounds status's partition count (STATUS_PARTITIONS):
// every partition's consumer is delivered every event.
const MaxStatusPartitions = 16

// StatusConsumer is the durable consumer of partition k of n of status's
// fold: ConsumerStatus with one partition, "status-<k>-of-<n>" with more.
func StatusConsumer(k, n int) string {
	if n <= 1 {
		return ConsumerStatus
	}
	return ConsumerStatus + "-" + strconv.Itoa(k) + "-of-" + strconv.Itoa(n)
}
