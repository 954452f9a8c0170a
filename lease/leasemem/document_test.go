package leasemem_test

import (
	"testing"

	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/lease/leasetest"
)

func TestDocuments(t *testing.T) {
	leasetest.RunDocuments(t, func(t *testing.T) leasetest.DocumentStore {
		return leasemem.NewDocumentStore(nil)
	})
}
