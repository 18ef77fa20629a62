package pipelinetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// PutAccount stores an account JSON in KV broadcast_accounts.
func (ts *Server) PutAccount(t testing.TB, name, account string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := ts.JS.KeyValue(ctx, contract.BucketAccounts)
	require.NoError(t, err)
	_, err = kv.Put(ctx, name, []byte(account))
	require.NoError(t, err)
}
